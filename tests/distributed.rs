//! Distributed jobs end to end: real `torch.distributed` (gloo on CPU)
//! under `torchrun`, ranks and their workers, the straggler, `-o`
//! placeholders, and `gpuprof merge` of two "nodes" on one machine.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use serde_json::Value;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuprof-dist-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The venv's `torchrun` (beside its python), when PyTorch is installed.
fn torchrun() -> Option<PathBuf> {
    let py = torch_python()?;
    let t = py.parent()?.join("torchrun");
    t.is_file().then_some(t)
}

/// A TCP port free right now on localhost (for the rendezvous).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    let tmp = tmpdir("torchrun");
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
    let tmp = tmpdir("placeholders");
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
