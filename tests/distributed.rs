//! Distributed jobs end to end: real `torch.distributed` (gloo on CPU)
//! under `torchrun`, ranks and their workers, the straggler, `-o`
//! placeholders, and `gpuprof merge` of two "nodes" on one machine.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::Value;

/// The PyTorch jobs run one at a time: on a 2-core machine two of them at
/// once starve each other's Python sampling.
static TORCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn torch_lock() -> std::sync::MutexGuard<'static, ()> {
    TORCH.lock().unwrap_or_else(|e| e.into_inner())
}

/// The venv's `torchrun` (beside its python), when PyTorch is installed.
fn torchrun() -> Option<PathBuf> {
    let py = torch_python()?;
    let t = py.parent()?.join("torchrun");
    t.is_file().then_some(t)
}

fn processes(r: &Value) -> &Vec<Value> {
    r["processes"].as_array().unwrap()
}

/// `train_ddp.py` arguments: rank 1's DataLoader worker spends 10× the CPU
/// per sample of rank 0's, so rank 0 waits for it in every all-reduce.
const DDP_ARGS: &[&str] = &[
    "--steps",
    "24",
    "--batch",
    "4",
    "--augment-ms",
    "2",
    "--slow-rank",
    "1",
    "--slow-factor",
    "10",
];

#[test]
fn torchrun_ranks_their_workers_and_the_straggler() {
    let Some(torchrun) = torchrun() else {
        skip!("no PyTorch virtual environment (see .ci/run): torchrun unavailable");
    };
    let _one_at_a_time = torch_lock();
    let tmp = scratch("torchrun");
    let port = free_port().to_string();
    let script = sample("train_ddp.py");
    let mut job: Vec<&str> = vec![
        torchrun.to_str().unwrap(),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        &port,
        script.to_str().unwrap(),
    ];
    job.extend(DDP_ARGS);
    let (out, o) = record(&tmp, "out", &["--no-gpu"], &job);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("rank 1/2: 24 steps"));
    let r = report(&out);
    let ps = processes(&r);
    let by_label = |l: &str| -> Vec<&Value> { ps.iter().filter(|p| p["label"] == l).collect() };

    // The agent is the launcher, not a third "main".
    let job_p = job_process(&r);
    assert_eq!(job_p["role"], "launcher", "{job_p}");
    assert_eq!(job_p["rank"], Value::Null);
    // Two ranks, each from its own environment.
    for rank in [0, 1] {
        let ranks = by_label(&format!("rank {rank}"));
        assert_eq!(ranks.len(), 1, "rank {rank}: {ps:?}");
        let p = ranks[0];
        assert_eq!(p["role"], "main");
        assert_eq!(p["rank"], rank);
        assert_eq!(p["local_rank"], rank);
        assert_eq!(p["world_size"], 2);
        assert_eq!(p["rank_env"]["RANK"], rank.to_string());
        assert_eq!(p["ppid"], job_p["pid"]);
        // Its DataLoader worker belongs to it.
        let workers = by_label(&format!("worker of rank {rank}"));
        assert_eq!(workers.len(), 1, "workers of rank {rank}: {ps:?}");
        assert_eq!(workers[0]["ppid"], p["pid"]);
        assert_eq!(workers[0]["rank"], rank);
    }
    // Only the rank variables of the environment were recorded.
    for p in ps {
        if let Some(env) = p["rank_env"].as_object() {
            for k in env.keys() {
                assert!(gpuprof::event::RANK_ENV_KEYS.contains(&k.as_str()), "{k}");
            }
        }
    }
    assert!(
        !std::fs::read_to_string(out.join("report.json"))
            .unwrap()
            .contains("MASTER_PORT"),
        "the rest of the environment must not be recorded"
    );
    let ranks = r["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    // Every rank has its own step rate, or says why not; the rank whose
    // steps are the job's has the job's rate.
    for x in ranks {
        let how = x["steps_how"].as_str().unwrap_or_else(|| panic!("{x}"));
        assert!(
            x["steps_per_s"].as_f64().is_some_and(|v| v > 0.0) || how.starts_with("no steps found"),
            "{x}"
        );
        if r["steps"]["pid"].is_number() && x["pids"][0] == r["steps"]["pid"] {
            let (a, b) = (
                x["steps_per_s"].as_f64(),
                r["steps"]["steps_per_s"].as_f64(),
            );
            assert!((a.unwrap() - b.unwrap()).abs() < 1e-3, "{x}");
        }
    }

    // Trace: named and ordered by rank.
    let t = check_trace(&out.join("trace.json"));
    let mut names: Vec<(i64, String)> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| {
            let pid = e["pid"].as_i64()?;
            let sort = t["traceEvents"]
                .as_array()?
                .iter()
                .find(|s| s["ph"] == "M" && s["name"] == "process_sort_index" && s["pid"] == pid)?;
            Some((
                sort["args"]["sort_index"].as_i64()?,
                e["args"]["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    names.sort();
    let pos = |prefix: &str| names.iter().position(|n| n.1.starts_with(prefix));
    let (l, r0, w0, r1, w1) = (
        pos("launcher · "),
        pos("rank 0 · "),
        pos("worker of rank 0 · "),
        pos("rank 1 · "),
        pos("worker of rank 1 · "),
    );
    assert!(
        l < r0 && r0 < w0 && w0 < r1 && r1 < w1 && w1.is_some(),
        "{names:?}"
    );

    // Findings: per rank, never merged, and the straggler.
    let findings = r["findings"].as_array().unwrap();
    for f in findings {
        let id = f["id"].as_str().unwrap();
        if [
            "input-pipeline-bound",
            "too-few-workers",
            "main-process-preprocessing",
            "io-bound",
        ]
        .contains(&id)
        {
            assert!(f["rank"].is_u64(), "a whole-job claim across ranks: {f}");
            assert!(f["title"].as_str().unwrap().starts_with("Rank "), "{f}");
        }
    }
    for x in ranks {
        assert!(
            x["collective_counted_from"].is_string(),
            "where the waits are counted from: {x}"
        );
    }
    if ranks
        .iter()
        .any(|x| x["collective_samples"].as_u64().unwrap_or(0) < 10)
    {
        skip!("too few Python stack samples of the ranks to compare their waits: {ranks:?}");
    }
    let wait = |rank: usize| ranks[rank]["collective_share"].as_f64().unwrap();
    assert!(
        wait(0) > wait(1) + 0.15,
        "rank 0 waits for rank 1 in all_reduce: {ranks:?}"
    );
    assert_eq!(ranks[0]["collective_functions"][0], "all_reduce");
    let s = findings
        .iter()
        .find(|f| f["id"] == "straggler-rank")
        .unwrap_or_else(|| panic!("no straggler finding: {findings:#?}"));
    assert_eq!(s["rank"], 1, "{s}");
    let title = s["title"].as_str().unwrap();
    assert!(
        title.starts_with("Rank 1 is the straggler") && title.contains("input pipeline"),
        "{title}"
    );
    assert!(s["gpu_time_s"].as_f64().unwrap() > 0.0);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("## Ranks") && md.contains("straggler-rank"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn output_placeholders_name_the_folder_from_the_launchers_variables() {
    let tmp = scratch("placeholders");
    let host = Command::new("hostname").arg("-s").output().unwrap();
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    let template = tmp.join("{job}").join("{host}-rank{rank}");
    let o = gpuprof()
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_PROCID", "3")
        .env_remove("RANK")
        .args(["-q", "--no-gpu", "--no-stacks", "-o"])
        .arg(&template)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dir = tmp.join("4242").join(format!("{host}-rank3"));
    let r = report(&dir);
    assert_eq!(r["rank"], "3");
    assert_eq!(r["rank_env"]["SLURM_JOB_ID"], "4242");

    // Unknown values stop gpuprof before the job runs.
    let marker = tmp.join("ran");
    let o = gpuprof()
        .env_remove("SLURM_STEP_ID")
        .args(["-q", "-o"])
        .arg(tmp.join("{step}"))
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("{step}") && err.contains("SLURM_STEP_ID"),
        "{err}"
    );
    assert!(!marker.exists(), "the job must not run");
    let _ = std::fs::remove_dir_all(&tmp);
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// First event time (µs) on each trace process whose name starts with
/// `prefix`.
fn first_ts(t: &Value, prefix: &str) -> Option<f64> {
    let evs = t["traceEvents"].as_array()?;
    let pids: Vec<i64> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter(|e| {
            e["args"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter_map(|e| e["pid"].as_i64())
        .collect();
    evs.iter()
        .filter(|e| e["pid"].as_i64().is_some_and(|p| pids.contains(&p)))
        .filter_map(|e| e["ts"].as_f64())
        .reduce(f64::min)
}

/// Two "nodes" on one machine: two `torchrun --nnodes 2` agents, each under
/// its own gpuprof with its own host name (a UTS namespace), rendezvous on
/// localhost; node-b's rank is slow. `gpuprof merge` puts both on one
/// timeline in the right order and names the slow node.
#[test]
fn two_nodes_merge_onto_one_timeline_and_name_the_slow_node() {
    let Some(torchrun) = torchrun() else {
        skip!("no PyTorch virtual environment (see .ci/run): torchrun unavailable");
    };
    if !is_root() {
        skip!("needs root for a UTS namespace per node (unshare -u)");
    }
    let probe = Command::new("unshare").args(["-u", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        skip!("unshare -u is not available here");
    }
    let _one_at_a_time = torch_lock();
    let tmp = scratch("nodes");
    let port = free_port().to_string();
    let script = sample("train_ddp.py");
    let node = |name: &str, node_rank: &str| {
        let mut c = Command::new("unshare");
        c.args(["-u", "sh", "-c", "hostname \"$0\" && exec \"$@\"", name])
            .arg(BIN)
            .args(["-q", "--no-gpu", "-o"])
            .arg(tmp.join(name))
            .arg("--")
            .arg(&torchrun)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                node_rank,
            ])
            .args(["--master-addr", "127.0.0.1", "--master-port", &port])
            .arg(&script)
            .args(DDP_ARGS)
            // gloo finds its peers by host name otherwise, and the
            // namespaces' names resolve nowhere.
            .env("GLOO_SOCKET_IFNAME", "lo")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().expect("start a node")
    };
    let a = node("node-a", "0");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let b = node("node-b", "1");
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for (n, o) in [("a", &oa), ("b", &ob)] {
        assert_eq!(
            o.status.code(),
            Some(0),
            "node-{n}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(report(&tmp.join("node-b"))["host"], "node-b");

    let merged = tmp.join("merged");
    let o = gpuprof()
        .arg("merge")
        .arg(tmp.join("node-a"))
        .arg(tmp.join("node-b"))
        .arg("-o")
        .arg(&merged)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&merged);
    let nodes = r["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["host"], "node-a");
    assert_eq!(nodes[1]["host"], "node-b");
    // One kernel: the boot ids match, the placement is exact.
    assert_eq!(nodes[1]["clock"]["method"], "same_boot", "{}", nodes[1]);
    let unc = r["clock"]["uncertainty_s"]
        .as_f64()
        .expect("a stated uncertainty");
    // node-b started ~1.5 s after node-a.
    let gap = nodes[1]["start_s"].as_f64().unwrap() - nodes[0]["start_s"].as_f64().unwrap();
    assert!(
        (1.3..3.5).contains(&gap),
        "node-b starts {gap} s after node-a"
    );

    // One timeline: grouped per node and rank, and in causal order — the
    // ranks start only once both agents have met, so after node-b's agent.
    let t = check_trace(&merged.join("trace.json"));
    let agent_b = first_ts(&t, "node-b · launcher · ").expect("node-b's agent");
    let agent_a = first_ts(&t, "node-a · launcher · ").expect("node-a's agent");
    let rank0 = first_ts(&t, "node-a · rank 0 · ").expect("rank 0 on node-a");
    let rank1 = first_ts(&t, "node-b · rank 1 · ").expect("rank 1 on node-b");
    let tol_us = unc * 1e6;
    assert!(agent_a + tol_us < agent_b, "{agent_a} {agent_b}");
    assert!(
        rank0 + tol_us >= agent_b,
        "rank 0 at {rank0} before node-b's agent at {agent_b}"
    );
    assert!(rank1 + tol_us >= agent_b);
    assert!(
        (rank0 - rank1).abs() < 3e6,
        "both ranks start after the rendezvous: {rank0} {rank1}"
    );
    // Every event of both nodes (stack slices, gap causes and their flows)
    // is a trace Perfetto's importer reads as the nodes' own.
    let full = tmp.join("merged-full");
    let o = gpuprof()
        .args(["merge", "-q", "--full-trace"])
        .arg(tmp.join("node-a"))
        .arg(tmp.join("node-b"))
        .arg("-o")
        .arg(&full)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let facts = check_outputs(&full).expect("a merged trace");
    assert!(facts.slices > 0 && facts.flows_checked == facts.flows);

    let ranks = r["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    if ranks
        .iter()
        .any(|x| x["collective_samples"].as_u64().unwrap_or(0) < 10)
    {
        skip!("too few Python stack samples of the ranks to compare their waits: {ranks:?}");
    }
    let findings = r["findings"].as_array().unwrap();
    let s = findings
        .iter()
        .find(|f| f["id"] == "straggler-rank" && f["host"].is_null())
        .unwrap_or_else(|| panic!("no merged straggler finding: {findings:#?}"));
    assert_eq!(s["rank"], 1);
    let title = s["title"].as_str().unwrap();
    assert!(title.contains("node-b"), "{title}");
    assert!(
        s["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains("ran on node-b")),
        "{s}"
    );
    let md = std::fs::read_to_string(merged.join("summary.md")).unwrap();
    assert!(md.contains("node-b") && md.contains("exact"), "{md}");

    // As if on two machines: no shared boot id, both clocks claimed
    // synchronised within 200 ms, node-b's wall clock 120 ms ahead. The
    // exact placement above is the truth; whichever method places node-b
    // now (collective boundaries or wall clocks) must be within the
    // uncertainty it states.
    let exact_gap = gap;
    for (name, skew_ns) in [("node-a", 0u64), ("node-b", 120_000_000)] {
        rewrite_header(&tmp.join(name), |h| {
            h["boot_id"] = Value::Null;
            h["clock"] = serde_json::json!({
                "synchronized": true, "max_error_us": 200_000,
                "est_error_us": 1_000, "source": "test",
            });
            let rt = h["anchor_realtime_ns"].as_u64().unwrap();
            h["anchor_realtime_ns"] = (rt + skew_ns).into();
        });
    }
    let merged2 = tmp.join("merged-hosts");
    let o = gpuprof()
        .arg("merge")
        .arg(tmp.join("node-a"))
        .arg(tmp.join("node-b"))
        .arg("-o")
        .arg(&merged2)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r2 = report(&merged2);
    let n2 = r2["nodes"].as_array().unwrap();
    // Either node can be the reference (the smaller clock error); the
    // other is placed relative to it.
    let placed = n2
        .iter()
        .find(|n| n["clock"]["method"] != "reference")
        .unwrap_or_else(|| panic!("one node placed relative to the other: {n2:?}"));
    let method = placed["clock"]["method"].as_str().unwrap();
    assert!(
        ["collective_boundaries", "wall_clock"].contains(&method),
        "{placed}"
    );
    let unc2 = placed["clock"]["uncertainty_s"]
        .as_f64()
        .expect("both clocks synchronised: a stated uncertainty");
    assert!(unc2 < 0.4 + 0.01, "{placed}");
    let gap2 = n2[1]["start_s"].as_f64().unwrap() - n2[0]["start_s"].as_f64().unwrap();
    let err = (gap2 - exact_gap).abs();
    assert!(
        err <= unc2 + 2e-6,
        "{} placed {err} s from the truth by {method}, stated ±{unc2} s",
        placed["host"]
    );
    if method == "wall_clock" {
        // The 120 ms skew is what is left.
        assert!((err - 0.12).abs() < 0.005, "{err}");
    }
    let md = std::fs::read_to_string(merged2.join("summary.md")).unwrap();
    let how = if method == "wall_clock" {
        "wall-clock anchors"
    } else {
        "collective boundaries"
    };
    assert!(md.contains(how), "{md}");
    eprintln!(
        "two hosts: {} placed by {method}, {err} s from the truth, stated ±{unc2} s",
        placed["host"]
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Rewrite a recording's header line with `edit`, keeping the rest.
fn rewrite_header(dir: &std::path::Path, edit: impl Fn(&mut Value)) {
    use std::io::{BufRead, Write};
    let p = dir.join("recording/events.jsonl.gz");
    let rd = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(
        std::fs::File::open(&p).unwrap(),
    ));
    let mut lines: Vec<String> = rd.lines().map(|l| l.unwrap()).collect();
    let mut h: Value = serde_json::from_str(&lines[0]).unwrap();
    edit(&mut h);
    lines[0] = h.to_string();
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&p).unwrap(),
        flate2::Compression::fast(),
    );
    for l in lines {
        writeln!(enc, "{l}").unwrap();
    }
    enc.finish().unwrap();
}

/// Recordings of other versions are merged and listed; missing, corrupt
/// and too-new ones are left out with the reason, and the rest merged.
#[test]
fn merge_leaves_out_bad_inputs_with_a_reason_and_merges_the_rest() {
    let tmp = scratch("merge-bad");
    let rec = |name: &str| {
        let (dir, o) = record(&tmp, name, &["--no-gpu", "--no-stacks"], &["sleep", "0.3"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        dir
    };
    let (a, older, newer, cut) = (rec("a"), rec("older"), rec("newer"), rec("cut"));
    rewrite_header(&older, |h| h["gpuprof_version"] = "0.0.1".into());
    rewrite_header(&newer, |h| h["version"] = 99.into());
    // Cut short mid-stream: its readable part is merged, with a warning.
    let ev = cut.join("recording/events.jsonl.gz");
    let bytes = std::fs::read(&ev).unwrap();
    std::fs::write(&ev, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let corrupt = tmp.join("corrupt");
    std::fs::create_dir_all(corrupt.join("recording")).unwrap();
    std::fs::write(
        corrupt.join("recording/events.jsonl.gz"),
        b"not gzip at all",
    )
    .unwrap();
    let missing = tmp.join("missing");

    let out = tmp.join("merged");
    let o = gpuprof()
        .arg("merge")
        .args([&a, &older, &newer, &cut, &corrupt, &missing])
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "some inputs were left out: {err}");
    let line = |p: &std::path::Path| {
        err.lines()
            .find(|l| l.starts_with(&format!("gpuprof: left out {}", p.display())))
            .unwrap_or_else(|| panic!("no line for {}: {err}", p.display()))
            .to_string()
    };
    assert!(line(&newer).contains("newer than this gpuprof"), "{err}");
    assert!(line(&corrupt).contains("not a gpuprof recording"), "{err}");
    assert!(line(&missing).contains("no such directory"), "{err}");
    let r = report(&out);
    let nodes = r["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(r["skipped"].as_array().unwrap().len(), 3);
    assert!(r["recorded_by_versions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v == "0.0.1"));
    let cut_node = nodes
        .iter()
        .find(|n| n["path"].as_str().unwrap().ends_with("cut"))
        .unwrap();
    assert_eq!(cut_node["complete"], false, "{cut_node}");
    check_trace(&out.join("trace.json"));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("## Left out") && md.contains("recorded by gpuprof 0.0.1"),
        "{md}"
    );

    // Nothing readable: an error, no outputs.
    let o = gpuprof()
        .arg("merge")
        .args([&corrupt, &missing])
        .arg("-o")
        .arg(tmp.join("none"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to merge"));
    assert!(!tmp.join("none").join("report.json").exists());
    let _ = std::fs::remove_dir_all(&tmp);
}
