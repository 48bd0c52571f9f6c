//! Fuzzing the recording reader and the analysis with mutated real
//! recordings: seeded (reproducible), a few hundred mutations, a few
//! seconds. Every mutated recording must be read without a panic, within a
//! time limit, and give a report.json with no impossible figure.
//!
//! `GPUPROF_FUZZ_SEED=N` and `GPUPROF_FUZZ_ITERATIONS=K` rerun a given
//! case or a longer campaign; a failing case is saved and its seed printed.

#[macro_use]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A small deterministic generator (splitmix64): the same seed gives the
/// same mutations on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break assumptions: zero, extremes, overflow, negative,
/// fractions, out-of-range codes.
const NASTY: &[&str] = &[
    "0",
    "1",
    "-1",
    "999",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "1e308",
    "-0",
    "0.5",
    "1000000000000000000",
];

/// One mutation of the event lines (line 0 is the header).
fn mutate(lines: &mut Vec<Vec<u8>>, rng: &mut Rng) -> String {
    let n = lines.len();
    let i = if n > 1 && rng.below(16) != 0 {
        1 + rng.below(n - 1)
    } else {
        rng.below(n)
    };
    match rng.below(11) {
        0 => {
            // A number replaced by a nasty value.
            let l = &lines[i];
            let mut runs = Vec::new();
            let mut k = 0;
            while k < l.len() {
                if l[k].is_ascii_digit() && (k == 0 || !l[k - 1].is_ascii_alphanumeric()) {
                    let s = k;
                    while k < l.len() && (l[k].is_ascii_digit() || l[k] == b'.') {
                        k += 1;
                    }
                    runs.push((s, k));
                } else {
                    k += 1;
                }
            }
            if runs.is_empty() {
                return "no number".into();
            }
            let (s, e) = runs[rng.below(runs.len())];
            let v = NASTY[rng.below(NASTY.len())];
            let mut m = l[..s].to_vec();
            m.extend_from_slice(v.as_bytes());
            m.extend_from_slice(&l[e..]);
            lines[i] = m;
            format!("number on line {i} -> {v}")
        }
        1 => {
            lines.remove(i);
            format!("delete line {i}")
        }
        2 => {
            let l = lines[i].clone();
            lines.insert(i, l);
            format!("duplicate line {i}")
        }
        3 => {
            // A repeated stretch, as a block written twice.
            let len = 1 + rng.below(60);
            let end = (i + len).min(n);
            let block: Vec<Vec<u8>> = lines[i..end].to_vec();
            let at = (end + rng.below(20)).min(lines.len());
            for (k, l) in block.into_iter().enumerate() {
                lines.insert(at + k, l);
            }
            format!("repeat lines {i}..{end}")
        }
        4 => {
            if i + 1 < lines.len() {
                lines.swap(i, i + 1);
            }
            format!("swap lines {i}, {}", i + 1)
        }
        5 => {
            let j = rng.below(n);
            let l = lines.remove(i);
            lines.insert(j.min(lines.len()), l);
            format!("move line {i} to {j}")
        }
        6 => {
            let l = &mut lines[i];
            if !l.is_empty() {
                let k = rng.below(l.len());
                l[k] = (rng.next() & 0xff) as u8;
            }
            format!("byte on line {i}")
        }
        7 => {
            let l = &mut lines[i];
            let k = rng.below(l.len() + 1);
            l.truncate(k);
            format!("cut line {i} at {k}")
        }
        8 => {
            lines.insert(i, vec![b'x'; 100_000 + rng.below(200_000)]);
            format!("long line at {i}")
        }
        9 => {
            // A value of one event kind in another's place: keys swapped.
            let l = String::from_utf8_lossy(&lines[i]).into_owned();
            let swaps = [
                ("\"t\":", "\"t0\":"),
                ("\"exited\"", "\"signaled\""),
                ("\"parent\":", "\"id\":"),
                ("\"user_ns\":", "\"sys_ns\":"),
                ("\"native\"", "\"python\""),
            ];
            let (a, b) = swaps[rng.below(swaps.len())];
            lines[i] = l.replacen(a, b, 1).into_bytes();
            format!("{a} -> {b} on line {i}")
        }
        _ => {
            // A shuffled window: records out of order.
            let len = 2 + rng.below(8);
            let end = (i + len).min(lines.len());
            lines[i..end].reverse();
            format!("reverse lines {i}..{end}")
        }
    }
}

/// Gzip the lines the way the writer does: independent members.
fn compress(lines: &[Vec<u8>], per_member: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in lines.chunks(per_member.max(1)) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for l in chunk {
            gz.write_all(l).unwrap();
            gz.write_all(b"\n").unwrap();
        }
        out.extend_from_slice(&gz.finish().unwrap());
    }
    out
}

/// Every impossible figure in a report, as (path, value).
fn impossible(r: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let cpus = r["system"]["cpus"].as_f64().unwrap_or(1.0).max(1.0);
    let dur = r["duration_s"].as_f64().unwrap_or(-1.0);
    if dur < 0.0 {
        bad.push(format!("duration_s {}", r["duration_s"]));
    }
    if let Some(c) = r["exit_code"].as_i64() {
        if !(0..=255).contains(&c) {
            bad.push(format!("exit_code {c}"));
        }
    }
    let pct_max = |v: &Value| v["max"].as_f64().unwrap_or(0.0);
    for p in r["processes"].as_array().into_iter().flatten() {
        let pid = &p["pid"];
        if pct_max(&p["cpu_pct"]) > 100.0 * cpus + 0.5 {
            bad.push(format!("process {pid} cpu_pct {}", p["cpu_pct"]));
        }
        let (s, e) = (p["start_s"].as_f64(), p["end_s"].as_f64());
        if let (Some(s), Some(e)) = (s, e) {
            if s < 0.0 || e < s - 1e-9 || e > dur + 1e-3 {
                bad.push(format!("process {pid} lifetime {s}..{e} of {dur}"));
            }
        }
        if let Some(c) = p["exit_code"].as_i64() {
            if !(0..=255).contains(&c) {
                bad.push(format!("process {pid} exit_code {c}"));
            }
        }
        for k in ["cpu_s", "cpu_user_s", "cpu_sys_s"] {
            if p[k].as_f64().is_some_and(|v| v < 0.0) {
                bad.push(format!("process {pid} {k} {}", p[k]));
            }
        }
        for t in p["threads"].as_array().into_iter().flatten() {
            if pct_max(&t["cpu_pct"]) > 100.5 {
                bad.push(format!("thread {} cpu_pct {}", t["tid"], t["cpu_pct"]));
            }
            for (st, secs) in t["state_s"].as_object().into_iter().flatten() {
                if secs.as_f64().unwrap_or(0.0) > dur + 1.0 {
                    bad.push(format!("thread {} {st} for {secs} s of {dur}", t["tid"]));
                }
            }
        }
    }
    let sys = &r["system"];
    for k in ["cpu_busy_pct", "iowait_pct", "steal_pct"] {
        if pct_max(&sys[k]) > 100.5 {
            bad.push(format!("system {k} {}", sys[k]));
        }
    }
    for d in sys["disks"].as_array().into_iter().flatten() {
        if pct_max(&d["busy_pct"]) > 100.5 {
            bad.push(format!("disk busy {}", d["busy_pct"]));
        }
    }
    for g in r["gpus"].as_array().into_iter().flatten() {
        let u = &g["utilization"];
        for k in ["mean_pct", "p50_pct", "p95_pct"] {
            if u[k].as_f64().is_some_and(|v| !(0.0..=100.0).contains(&v)) {
                bad.push(format!("gpu {k} {}", u[k]));
            }
        }
        if g["busy_fraction"]
            .as_f64()
            .is_some_and(|v| !(0.0..=1.0).contains(&v))
        {
            bad.push(format!("gpu busy_fraction {}", g["busy_fraction"]));
        }
        let gaps = &g["idle_gaps"];
        if gaps["total_s"].as_f64().is_some_and(|v| v > dur + 1.0) {
            bad.push(format!("gpu idle {} s of {dur}", gaps["total_s"]));
        }
    }
    let st = &r["stacks"];
    if st["unwind_coverage"]
        .as_f64()
        .is_some_and(|v| !(0.0..=1.0).contains(&v))
    {
        bad.push(format!("unwind_coverage {}", st["unwind_coverage"]));
    }
    for f in r["findings"].as_array().into_iter().flatten() {
        if f["gpu_time_share"]
            .as_f64()
            .is_some_and(|v| !(0.0..=1.0).contains(&v))
        {
            bad.push(format!("finding {} share {}", f["id"], f["gpu_time_share"]));
        }
        if f["gpu_time_s"].as_f64().is_some_and(|v| v > dur + 1.0) {
            bad.push(format!(
                "finding {} {} s of {dur}",
                f["id"], f["gpu_time_s"]
            ));
        }
    }
    bad
}

/// Read, analyse and export one recording folder as `gpuprof report` does.
fn analyse(dir: &Path, full: bool) -> Result<Option<Value>, String> {
    let a = match gpuprof::analysis::analyze_dir(dir) {
        Ok(a) => a,
        // A header damaged beyond use: a clean refusal is fine.
        Err(_) => return Ok(None),
    };
    let d = gpuprof::diagnose::diagnose_analysis(&a);
    let mut r = gpuprof::export::report::build(&a);
    gpuprof::export::report::add_diagnosis(&mut r, &d);
    let _ = gpuprof::export::summary::markdown(&a, &d);
    let _ = gpuprof::export::summary::terminal(&a, &d);
    gpuprof::export::trace::write(&a, std::io::sink(), &Default::default())
        .map_err(|e| e.to_string())?;
    if full {
        let out = dir.join("out");
        let (od, _) = gpuprof::outdir::OutDir::open(&out, true).map_err(|e| e.to_string())?;
        gpuprof::outputs::generate(dir, &od, &Default::default()).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&out);
    }
    Ok(Some(serde_json::to_value(&r).map_err(|e| e.to_string())?))
}

/// A real recording of a small training job (with GPU events from the fake
/// NVML, and stacks where perf is allowed).
fn real_recording(tmp: &Path) -> PathBuf {
    let out = tmp.join("base");
    let o = gpuprof()
        .env("GPUPROF_NVML_LIB", fake_nvml_dir().join("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", sample("gpu/activity.json"))
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", "python3"])
        .arg(sample("train_sim.py"))
        .args(["--workers", "2", "--steps", "40", "--gpu-ms", "5"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("recording/events.jsonl.gz")
}

/// CPU time of this process (the machine may be busy with others).
fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[test]
fn mutated_recordings_never_panic_hang_or_report_the_impossible() {
    let tmp = tempfile::Builder::new()
        .prefix("gpuprof-fuzz-")
        .tempdir()
        .unwrap();
    let base = real_recording(tmp.path());
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&base).unwrap()),
        &mut text,
    )
    .unwrap();
    let lines: Vec<Vec<u8>> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| l.to_vec())
        .collect();
    assert!(lines.len() > 100, "a real recording: {} lines", lines.len());
    // The unmutated recording itself is clean.
    let dir = tmp.path().join("case");
    std::fs::create_dir_all(dir.join("recording")).unwrap();
    std::fs::write(dir.join("recording/events.jsonl.gz"), compress(&lines, 64)).unwrap();
    let r = analyse(&dir, true)
        .unwrap()
        .expect("the base recording reads");
    assert_eq!(r["warnings"], serde_json::json!([]), "{}", r["warnings"]);
    assert!(impossible(&r).is_empty(), "{:?}", impossible(&r));

    let env_u64 = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let first = env_u64("GPUPROF_FUZZ_SEED").unwrap_or(1);
    let count =
        env_u64("GPUPROF_FUZZ_ITERATIONS").unwrap_or(if env_u64("GPUPROF_FUZZ_SEED").is_some() {
            1
        } else {
            300
        });
    let started = Instant::now();
    let cpu0 = cpu_s();
    let mut slowest = Duration::ZERO;
    let mut refused = 0;
    let mut warned = 0;
    for seed in first..first + count {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let mut ls = lines.clone();
        let mut what = Vec::new();
        for _ in 0..1 + rng.below(3) {
            what.push(mutate(&mut ls, &mut rng));
        }
        let mut bytes = compress(&ls, 1 + rng.below(80));
        match rng.below(6) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let k = rng.below(bytes.len());
                    bytes[k] ^= 1 << rng.below(8);
                    what.push(format!("bit flip at byte {k}"));
                }
            }
            1 => {
                let k = rng.below(bytes.len());
                bytes.truncate(k);
                what.push(format!("file cut at {k}"));
            }
            _ => {}
        }
        std::fs::write(dir.join("recording/events.jsonl.gz"), &bytes).unwrap();
        let t = Instant::now();
        let full = seed % 16 == 0;
        let res = std::panic::catch_unwind(|| analyse(&dir, full));
        let took = t.elapsed();
        if std::env::var_os("GPUPROF_FUZZ_VERBOSE").is_some() {
            eprintln!("seed {seed}: {} ms {}", took.as_millis(), what.join(", "));
        }
        slowest = slowest.max(took);
        let keep = |why: &str| {
            let saved = std::env::temp_dir().join(format!("gpuprof-fuzz-case-{seed}.jsonl.gz"));
            std::fs::write(&saved, &bytes).unwrap();
            panic!(
                "seed {seed} ({}): {why}; the recording is saved as {}; rerun with GPUPROF_FUZZ_SEED={seed}",
                what.join(", "),
                saved.display()
            );
        };
        match res {
            Err(_) => keep("panicked"),
            Ok(Err(e)) => keep(&format!("failed: {e}")),
            Ok(Ok(None)) => refused += 1,
            Ok(Ok(Some(r))) => {
                let bad = impossible(&r);
                if !bad.is_empty() {
                    keep(&format!("impossible figures: {bad:?}"));
                }
                if r["warnings"].as_array().is_some_and(|w| !w.is_empty()) {
                    warned += 1;
                }
            }
        }
        if took > Duration::from_secs(5) {
            keep(&format!("took {took:?}"));
        }
    }
    eprintln!(
        "{count} mutated recordings in {:.1} s ({:.1} s of CPU; slowest {:.0} ms): {refused} refused as unreadable, {warned} read with a warning",
        started.elapsed().as_secs_f64(),
        cpu_s() - cpu0,
        slowest.as_secs_f64() * 1e3
    );
}
