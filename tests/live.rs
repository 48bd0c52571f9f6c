//! While recording and around it: `gpuprof explain`, the Prometheus
//! endpoint (`--metrics-addr`), the progress line on a terminal and the
//! early warnings. Every test runs the real binary on real processes.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpuprof::diagnose::FindingKind;

#[test]
fn explain_lists_and_prints_every_finding() {
    let o = gpuprof().arg("explain").output().unwrap();
    assert!(o.status.success());
    let list = String::from_utf8_lossy(&o.stdout);
    for k in FindingKind::ALL {
        assert!(
            list.lines().any(|l| l.trim_start().starts_with(k.id())),
            "{} not listed:\n{list}",
            k.id()
        );
        let o = gpuprof().args(["explain", k.id()]).output().unwrap();
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.starts_with(&format!("## {}\n", k.id())), "{text}");
        assert!(text.contains("**Fix:**"), "{text}");
    }
    let o = gpuprof()
        .args(["explain", "gpu-too-slow"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("gpu-too-slow"), "{err}");
    for k in FindingKind::ALL {
        assert!(err.contains(k.id()), "{err}");
    }
}

/// The job of the metrics test: known CPU and IO, then it waits.
const METRICS_JOB: &str = r#"
import os, sys, time
ready, go, data = sys.argv[1], sys.argv[2], sys.argv[3]
end = time.thread_time() + 1.5
x = 0
while time.thread_time() < end:
    x += 1
with open(data, "wb") as f:
    f.write(os.urandom(8 << 20))
    f.flush()
    os.fsync(f.fileno())
open(ready, "w").close()
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
"#;

fn scenario(dir: &Path, body: serde_json::Value) -> std::path::PathBuf {
    let p = dir.join("scenario.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&body).unwrap()).unwrap();
    p
}

fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

/// `name{labels} value` lines, keyed by `name{labels}`.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn metric(m: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = m
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in {m:#?}");
    found[0]
}

#[test]
fn metrics_endpoint_serves_the_live_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let (ready, go, data) = (
        tmp.path().join("ready"),
        tmp.path().join("go"),
        tmp.path().join("data.bin"),
    );
    let job = tmp.path().join("metrics_job.py");
    std::fs::write(&job, METRICS_JOB).unwrap();
    let scen = scenario(
        tmp.path(),
        serde_json::json!({
            "description": "40% busy, power-capped, the job's python process on the GPU with 3 GiB",
            "devices": [{
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": 81559,
                "sample_period_ms": 100,
                "utilization": 40,
                "temperature_c": 61,
                "throttle_reasons": ["sw_power_cap"],
                "processes": [{"cmdline_contains": "metrics_job.py", "type": "compute", "used_memory_mib": 3072, "sm_util": 40}]
            }]
        }),
    );
    let port = free_port();
    let out = tmp.path().join("out");
    let mut child = gpuprof()
        .env("GPUPROF_NVML_LIB", fake_nvml_dir().join("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", &scen)
        .args(["-q", "--no-stacks", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg("python3")
        .arg(&job)
        .args([&ready, &go, &data])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the job never got ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let the last /proc and NVML samples land after the job's work.
    std::thread::sleep(Duration::from_millis(1500));
    let (head, body) = http_get(port, "/metrics").expect("GET /metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let (head404, _) = http_get(port, "/nothing").unwrap();
    assert!(head404.starts_with("HTTP/1.1 404"), "{head404}");
    std::fs::write(&go, b"").unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");

    let m = parse_metrics(&body);
    let report = report(&out);
    let roles = &report["roles"];
    // CPU: the job's work was done before the scrape; it slept after.
    let main_cpu = roles["main"]["cpu_s"].as_f64().unwrap();
    let live_cpu = metric(&m, "gpuprof_cpu_seconds_total", &["role=\"main\""]);
    assert!(main_cpu >= 1.4, "{main_cpu}");
    assert!(
        live_cpu <= main_cpu + 0.02 && live_cpu >= main_cpu - 0.2,
        "live main CPU {live_cpu} vs recorded {main_cpu}"
    );
    // IO: all written and synced before the scrape.
    let wrote = roles["main"]["write_bytes"].as_f64().unwrap();
    let live_wrote = metric(&m, "gpuprof_write_bytes_total", &["role=\"main\""]);
    assert!(wrote >= 8.0 * 1024.0 * 1024.0, "{wrote}");
    assert_eq!(live_wrote, wrote);
    assert_eq!(metric(&m, "gpuprof_processes", &["role=\"main\""]), 1.0);
    // GPU: busy share, memory per GPU and per process, throttling.
    let gpu = &report["gpus"][0];
    let busy = gpu["busy_fraction"].as_f64().unwrap();
    let live_busy = metric(&m, "gpuprof_gpu_busy_ratio", &["gpu=\"0\""]);
    assert!((busy - 0.40).abs() < 0.02, "{busy}");
    assert!(
        (live_busy - busy).abs() < 0.02,
        "live {live_busy} vs {busy}"
    );
    let proc_mem = gpu["processes"][0]["memory_max_bytes"].as_f64().unwrap();
    assert_eq!(proc_mem, 3072.0 * 1024.0 * 1024.0);
    assert_eq!(
        metric(&m, "gpuprof_gpu_process_memory_bytes", &["role=\"main\""]),
        proc_mem
    );
    let used = gpu["memory"]["used_max_bytes"].as_f64().unwrap();
    assert_eq!(
        metric(&m, "gpuprof_gpu_memory_used_bytes", &["gpu=\"0\""]),
        used
    );
    assert_eq!(
        metric(&m, "gpuprof_gpu_temperature_celsius", &["gpu=\"0\""]),
        61.0
    );
    let capped = gpu["throttle_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["reason"] == "sw_power_cap")
        .and_then(|t| t["seconds"].as_f64())
        .expect("power cap in the report");
    let live_capped = metric(
        &m,
        "gpuprof_gpu_throttle_seconds_total",
        &["reason=\"sw_power_cap\""],
    );
    let recorded = metric(&m, "gpuprof_recording_seconds", &[]);
    assert!(
        live_capped <= capped + 0.2 && live_capped >= recorded - 1.5,
        "live {live_capped} s capped after {recorded} s; the report says {capped}"
    );
    let idle = metric(&m, "gpuprof_gpu_idle_seconds_total", &["gpu=\"0\""]);
    let busy_s = metric(&m, "gpuprof_gpu_busy_seconds_total", &["gpu=\"0\""]);
    assert!(
        (busy_s / (busy_s + idle) - 0.4).abs() < 0.02,
        "{busy_s} {idle}"
    );
    assert!(metric(&m, "gpuprof_recording_bytes", &[]) > 0.0);
}

#[test]
fn bad_metrics_addr_stops_before_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = taken.local_addr().unwrap().to_string();
    for (addr, says) in [
        ("not-an-address", "not an address"),
        ("127.0.0.1:99999", "not an address"),
        (in_use.as_str(), "already in use"),
    ] {
        let marker = tmp.path().join("job-ran");
        let out = tmp.path().join("out");
        let o = gpuprof()
            .args(["--no-gpu", "--no-stacks", "--metrics-addr", addr, "-o"])
            .arg(&out)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{addr}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{addr}: {err}");
        assert!(
            err.contains("--metrics-addr") && err.contains(says),
            "{addr}: {err}"
        );
        assert!(
            !marker.exists(),
            "the job ran despite --metrics-addr {addr}"
        );
        assert!(
            !out.exists(),
            "an output folder was made for --metrics-addr {addr}"
        );
    }
}

/// Run gpuprof with stdout and stderr on a fresh pseudo-terminal; returns
/// everything the terminal received.
fn on_pty(args: &[&str]) -> String {
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string();
        let master = OwnedFd::from_raw_fd(master);
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let ws = libc::winsize {
            ws_row: 40,
            ws_col: 160,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(slave.as_raw_fd(), libc::TIOCSWINSZ, &ws);
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave)
            .spawn()
            .unwrap();
        let mut f = std::fs::File::from(master);
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = [0u8; 4096];
            // EIO once every holder of the terminal has closed it.
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                all.extend_from_slice(&buf[..n]);
            }
            all
        });
        let st = child.wait().unwrap();
        let all = reader.join().unwrap();
        let text = String::from_utf8_lossy(&all).into_owned();
        assert!(st.success(), "{text}");
        if let Some(i) = args.iter().position(|a| *a == "-o") {
            check_outputs(Path::new(args[i + 1]));
        }
        text
    }
}

const LINE: &str = "gpuprof: recording ";
const UP_ERASE: &str = "\x1b[A\r\x1b[K";

#[test]
fn progress_line_on_a_terminal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a");
    let job = "echo job-start; sleep 7; echo job-end";
    let text = on_pty(&[
        "--no-gpu",
        "--no-stacks",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        job,
    ]);
    let first = text
        .find(LINE)
        .unwrap_or_else(|| panic!("no progress line: {text:?}"));
    assert!(text.find("job-start").unwrap() < first, "{text:?}");
    // Updated in place at least once while the job was quiet.
    assert!(text.matches(LINE).count() >= 2, "{text:?}");
    assert!(
        text[first..].contains(&format!("{UP_ERASE}{LINE}")),
        "{text:?}"
    );
    // The job's next output comes on a line of its own, after the line's
    // newline, never glued to it.
    let end = text.find("job-end").unwrap();
    let before = &text[..end];
    assert!(before.ends_with("\r\n"), "{text:?}");
    // Cleared at the end: erased once the job is done, before the summary.
    let last = text.rfind(LINE).unwrap();
    let summary = text.find("== gpuprof diagnosis").unwrap();
    assert!(last < end && end < summary, "{text:?}");

    // The same job with -q, and with stderr not a terminal: no line.
    let quiet = on_pty(&[
        "-q",
        "--no-gpu",
        "--no-stacks",
        "-o",
        tmp.path().join("b").to_str().unwrap(),
        "--",
        "sh",
        "-c",
        job,
    ]);
    assert!(
        !quiet.contains(LINE) && !quiet.contains('\x1b'),
        "{quiet:?}"
    );
    let o = gpuprof()
        .args(["--no-gpu", "--no-stacks", "-o"])
        .arg(tmp.path().join("c"))
        .args(["--", "sh", "-c", job])
        .output()
        .unwrap();
    assert!(o.status.success());
    check_outputs(&tmp.path().join("c"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains(LINE) && !err.contains('\x1b'), "{err}");
}

#[test]
fn progress_line_is_erased_when_the_job_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let text = on_pty(&[
        "--no-gpu",
        "--no-stacks",
        "-o",
        tmp.path().join("a").to_str().unwrap(),
        "--",
        "sleep",
        "6",
    ]);
    let last = text
        .rfind(LINE)
        .unwrap_or_else(|| panic!("no progress line: {text:?}"));
    let rest = &text[last..];
    let line_end = rest.find("\r\n").unwrap();
    assert!(
        rest[line_end + 2..].starts_with(UP_ERASE),
        "the last progress line was not erased: {text:?}"
    );
}

#[test]
fn early_warnings_name_the_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let scen = scenario(
        tmp.path(),
        serde_json::json!({
            "description": "A hot, power-capped GPU with its memory full, busy 10%",
            "devices": [{
                "sample_period_ms": 100,
                "utilization": 10,
                "temperature_c": 92,
                "power_w": 640,
                "memory_total_mib": 81559,
                "memory_used_mib": 80000,
                "throttle_reasons": ["hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap"],
                "processes": [{"cmdline_contains": "sleep", "type": "compute", "used_memory_mib": 1024}]
            }]
        }),
    );
    let run = |quiet: bool, dir: &str| {
        let mut c = gpuprof();
        c.env("GPUPROF_NVML_LIB", fake_nvml_dir().join("libfake_nvml.so"))
            .env("FAKE_NVML_SCENARIO", &scen)
            .args(["--no-stacks", "--warn-after", "3s", "-o"])
            .arg(tmp.path().join(dir));
        if quiet {
            c.arg("-q");
        }
        let o = c.args(["--", "sleep", "6"]).output().unwrap();
        assert!(o.status.success());
        check_outputs(&tmp.path().join(dir));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(false, "a");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gpuprof: warning:"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("thermally throttled") && w.contains("[thermal-throttling")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("GPU 0 held by its power cap for 100%")
                && w.contains("drawing 640 W")
                && w.contains("[power-capped")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("GPU 0 memory was at least 95% full")
                && w.contains("80000 of 81559 MiB")
                && w.contains("[gpu-memory-pressure")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("GPU 0 was busy only 10%")),
        "{err}"
    );
    // Each once, although the conditions held until the end.
    assert_eq!(warnings.len(), 4, "{err}");
    let quiet = run(true, "b");
    assert!(!quiet.contains("warning"), "{quiet}");
}

/// A real cgroup-v1 CPU quota of 0.3 CPU on a job that wants a whole
/// core: the early warning names the limit and the finding, while the job
/// runs.
#[test]
fn a_binding_cpu_limit_is_warned_about_early() {
    let cg = match TestCgroup::v1(
        "cpu",
        "warn",
        &[
            ("cpu.cfs_period_us", "100000".into()),
            ("cpu.cfs_quota_us", "30000".into()),
        ],
    ) {
        Ok(c) => c,
        Err(why) => skip!("cgroup CPU quota: {why}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let busy = "import time\nend = time.time() + 7\nwhile time.time() < end: pass";
    let o = gpuprof()
        .env_remove("GPUPROF_NVML_LIB")
        .args(["--no-stacks", "--warn-after", "3s", "-o"])
        .arg(tmp.path().join("out"))
        .arg("--")
        .args(cg.wrap(&["python3", "-c", busy]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    check_outputs(&tmp.path().join("out"));
    let warning = err
        .lines()
        .find(|l| l.starts_with("gpuprof: warning:") && l.contains("[cpu-limit"))
        .unwrap_or_else(|| panic!("a cpu-limit warning: {err}"));
    assert!(
        warning.contains("CPU limit (0.3 cores) throttled it in"),
        "{warning}"
    );
}
