//! Faults and hostile conditions, on real processes and real files: another
//! user's symlinks in the output folder, a full disk, a gpuprof killed
//! mid-run, damaged recordings, a report run against a live session.

#[macro_use]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gpuprof-test-")
        .tempdir()
        .unwrap()
}

fn is_root() -> bool {
    // SAFETY: no arguments, no failure.
    unsafe { libc::geteuid() == 0 }
}

const NOBODY: u32 = 65534;

/// Run a shell command as `nobody`.
fn as_nobody(script: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .args(["-c", script])
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run sh as nobody")
}

/// Temporaries gpuprof may leave: there must be none after a run.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gpuprof-tmp") || n.ends_with(".tmp") || n.contains("write-test"))
        .collect()
}

#[test]
fn root_never_writes_through_another_users_symlinks() {
    if !is_root() {
        skip!("needs root (the attack is on root)");
    }
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "root only").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let marker = d.path().join("job-ran");
    let job = format!("touch {}", marker.display());

    // 1. A folder nobody made, full of symlinks to the victim.
    let dir = d.path().join("theirs");
    let names = [
        ".gpuprof-write-test",
        "trace.tmp",
        "report.tmp",
        "summary.tmp",
        "report.json",
        "trace.json",
        "summary.md",
    ];
    let mut script = format!("mkdir {} ", dir.display());
    for n in names {
        script.push_str(&format!(
            "&& ln -s {} {}/{n} ",
            victim.display(),
            dir.display()
        ));
    }
    let o = as_nobody(&script);
    if !o.status.success() {
        skip!(
            "cannot act as nobody: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = gpuprof()
        .arg("-o")
        .arg(&dir)
        .args(["--", "sh", "-c", &job])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("belongs to uid 65534 (nobody)") && err.contains("-o DIR"),
        "a clear refusal: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!marker.exists(), "the job must not run");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only");

    // 2. The output folder itself is nobody's symlink to a root folder.
    let rootdir = d.path().join("rootdir");
    std::fs::create_dir(&rootdir).unwrap();
    let link = d.path().join("link");
    let o = as_nobody(&format!("ln -s {} {}", rootdir.display(), link.display()));
    assert!(o.status.success());
    let o = gpuprof()
        .arg("-o")
        .arg(&link)
        .args(["--", "sh", "-c", &job])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(err.contains("symlink owned by uid 65534"), "{err}");
    assert!(!marker.exists());
    assert_eq!(std::fs::read_dir(&rootdir).unwrap().count(), 0);

    // 3. `gpuprof report -o` into nobody's folder is refused the same way.
    let (rec, o) = record(d.path(), "rec", &[], &["true"]);
    assert!(o.status.success());
    let o = gpuprof()
        .arg("report")
        .arg(&rec)
        .arg("-o")
        .arg(&dir)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("belongs to uid 65534"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only");

    // 4. Symlinks of nobody's where gpuprof writes, in a folder root owns
    // (planted before it was root's, say): replaced, never followed.
    let out = rec;
    let mine = d.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    for n in names {
        std::os::unix::fs::symlink(&victim, mine.join(n)).unwrap();
        std::os::unix::fs::lchown(mine.join(n), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let o = gpuprof()
        .arg("report")
        .arg("-q")
        .arg(&out)
        .arg("-o")
        .arg(&mine)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only");
    for n in ["report.json", "trace.json", "summary.md"] {
        let md = std::fs::symlink_metadata(mine.join(n)).unwrap();
        assert!(
            md.is_file() && md.uid() == 0,
            "{n} replaced by root's own file"
        );
    }
    assert!(leftovers(&mine).iter().all(|n| names.contains(&n.as_str())));

    // 5. `gpuprof merge` writes the same way: refused in nobody's folder,
    // symlinks replaced in root's.
    let o = gpuprof()
        .arg("merge")
        .arg(&out)
        .arg("-o")
        .arg(&dir)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("belongs to uid 65534"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let merged = d.path().join("merged");
    std::fs::create_dir(&merged).unwrap();
    for n in names {
        std::os::unix::fs::symlink(&victim, merged.join(n)).unwrap();
        std::os::unix::fs::lchown(merged.join(n), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let o = gpuprof()
        .args(["merge", "-q"])
        .arg(&out)
        .arg("-o")
        .arg(&merged)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only");
    for n in ["report.json", "trace.json", "summary.md"] {
        let md = std::fs::symlink_metadata(merged.join(n)).unwrap();
        assert!(
            md.is_file() && md.uid() == 0,
            "{n} replaced by root's own file"
        );
    }
    assert!(leftovers(&merged)
        .iter()
        .all(|n| names.contains(&n.as_str())));
}

#[test]
fn a_command_behind_an_unsearchable_folder_is_not_called_missing() {
    if !is_root() {
        skip!("needs root (to act as nobody)");
    }
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let locked = d.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let prog = locked.join("run.sh");
    std::fs::write(&prog, "#!/bin/sh\ntrue\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    // An output folder nobody may write.
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(NOBODY), Some(NOBODY)).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gpuprof"))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .current_dir(d.path())
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(126), "{err}");
    assert!(
        err.contains("cannot reach") && err.contains("permission denied"),
        "{err}"
    );
    assert!(!err.contains("not found"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "nothing left for a job that never ran"
    );
}

#[test]
fn a_folder_with_earlier_outputs_is_refused_before_the_job_runs() {
    let d = tmp();
    let dir = d.path().join("o");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    std::fs::write(dir.join("report.json"), "{}").unwrap();
    let marker = d.path().join("job-ran");
    let (_, o) = record(
        d.path(),
        "o",
        &[],
        &["sh", "-c", &format!("touch {}", marker.display())],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(err.contains("already holds report.json"), "{err}");
    assert!(!marker.exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("report.json")).unwrap(),
        "{}"
    );
    // Unrelated files are fine: nothing of theirs is replaced.
    std::fs::remove_file(dir.join("report.json")).unwrap();
    let (_, o) = record(d.path(), "o", &[], &["true"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn reports_run_against_a_live_session_never_disturb_it() {
    let d = tmp();
    let out = d.path().join("o");
    for round in 0..3 {
        let out = out.with_extension(round.to_string());
        let mut session = gpuprof()
            .arg("-q")
            .arg("-o")
            .arg(&out)
            .args([
                "--",
                "sh",
                "-c",
                "i=0; while [ $i -lt 30 ]; do i=$((i+1)); sleep 0.05; done; exit 4",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reports = 0;
        let mut snapshots = 0;
        let t = Instant::now();
        // Reports back to back, until (and just after) the session ends.
        let status = loop {
            if out.join("recording/events.jsonl.gz").exists() {
                let o = gpuprof().arg("report").arg(&out).output().unwrap();
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(
                    o.status.success() || err.contains("not a gpuprof recording"),
                    "{err}"
                );
                reports += 1;
                if err.contains("snapshot") {
                    snapshots += 1;
                }
            }
            if let Some(st) = session.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < Duration::from_secs(60));
        };
        let o = session.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(status.code(), Some(4), "{err}");
        assert!(
            err.trim().is_empty(),
            "the session says nothing with -q: {err}"
        );
        assert!(reports > 0);
        let r = report(&out);
        assert_eq!(r["complete"], true, "the session's final write won: {r:#}");
        assert_eq!(r["exit_code"], 4);
        assert_eq!(r["stop_reason"], "job exited");
        check_trace(&out.join("trace.json"));
        assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
        eprintln!("round {round}: {reports} reports, {snapshots} snapshots");
    }
}

/// A tmpfs of `size` mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_disk_leaves_the_small_outputs_and_the_jobs_status() {
    let d = tmp();
    let mnt = d.path().join("mnt");
    let Some(_fs) = Tmpfs::mount(&mnt, "16m") else {
        skip!("cannot mount a tmpfs (needs root and CAP_SYS_ADMIN)");
    };
    // The job fills the disk a second in, keeps running, then exits 7.
    // After the fill it starts 300 processes with distinct command lines:
    // records that cannot fit in the slack of the recording's last page,
    // however few /proc samples a loaded machine takes meanwhile (a write
    // into that slack needs no new page and succeeded on a full tmpfs).
    let fill = mnt.join("fill");
    let job = format!(
        "sleep 1; head -c 100M /dev/zero > {} 2>/dev/null; echo job-output; for i in $(seq 300); do /bin/true $i-$i-$i; done; sleep 1; exit 7",
        fill.display()
    );
    let out = mnt.join("o");
    let o = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", "sh", "-c", &job])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "the job's status: {err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "job-output");
    assert!(
        err.contains("PROFILE INCOMPLETE"),
        "a distinct message: {err}"
    );
    assert!(err.contains("exited with code 7"), "{err}");
    assert!(err.contains("No space left"), "{err}");
    let r = report(&out);
    assert_eq!(r["complete"], false);
    assert_eq!(r["exit_code"], 7);
    assert!(
        r["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("No space left")),
        "{r:#}"
    );
    assert!(out.join("summary.md").is_file());
    let dur = r["duration_s"].as_f64().unwrap();
    assert!(
        dur < 2.5,
        "the recording stops where the disk filled: {dur}"
    );
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    if !out.join("trace.json").exists() {
        assert!(r["outputs_missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["file"] == "trace.json"));
    }
    // The readable part is a valid recording: with space again, `gpuprof
    // report` rebuilds everything, with the same figures.
    std::fs::remove_file(&fill).unwrap();
    let o = gpuprof()
        .arg("report")
        .arg("-q")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r2 = report(&out);
    assert_eq!(r2["exit_code"], 7);
    assert_eq!(r2["duration_s"], r["duration_s"]);
    check_trace(&out.join("trace.json"));

    // A disk with almost no room from the start: gpuprof warns, the job
    // runs, and whatever fits is written.
    let _ = std::fs::remove_dir_all(&out);
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c 100M /dev/zero > {} 2>/dev/null; truncate -s -64K {}",
            fill.display(),
            fill.display()
        ))
        .status()
        .unwrap();
    assert!(o.success());
    let o = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", "sh", "-c", "echo ran; exit 3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ran");
    assert!(
        err.contains("nearly full") || err.contains("PROFILE INCOMPLETE"),
        "{err}"
    );
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
}

/// The real interpreter, not a wrapper that execs it (pyenv shims).
fn python() -> String {
    let o = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn a_killed_gpuprof_leaves_named_stacks_and_python_frames() {
    need_perf!();
    let d = tmp();
    let out = d.path().join("o");
    let script = repo().join("tests/scripts/stacks_job.py");
    let child = gpuprof()
        .arg("-q")
        .arg("-o")
        .arg(&out)
        .args(["--", &python(), script.to_str().unwrap(), "6", "2", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    // The OOM killer's way: no chance to finish anything.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = child.id();
    let o = child.wait_with_output().unwrap();
    // The job carries on without gpuprof and ends normally.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("steps done"),
        "the job finished: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Its runtime folders (agents, rings: memory, on tmpfs) were left; the
    // next recording removes them, the job being gone.
    let left = || -> Vec<PathBuf> {
        let mut bases = vec![std::env::temp_dir(), PathBuf::from("/dev/shm")];
        bases.extend(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from));
        bases
            .iter()
            .filter_map(|b| std::fs::read_dir(b).ok())
            .flat_map(|rd| rd.flatten().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with(&format!("gpuprof-{killed}-"))
                    || n.starts_with(&format!("gpuprof-nvtx-{killed}-"))
            })
            .collect()
    };
    assert!(!left().is_empty(), "a killed gpuprof leaves its folders");
    let o = gpuprof()
        .args(["-q", "-o"])
        .arg(d.path().join("next"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        left(),
        Vec::<PathBuf>::new(),
        "removed by the next recording"
    );
    let o = gpuprof().arg("report").arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let r = report(&out);
    assert_eq!(r["complete"], false);
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("no end marker"), "{warnings}");
    assert!(err.contains("no end marker"), "said plainly: {err}");
    let s = &r["stacks"];
    assert!(s["samples"].as_u64().unwrap() >= 20, "{s}");
    // Python frames of the same instant, from the agent's rings (py-spy
    // leaves the processes the agent samples alone).
    assert!(s["python"]["same_instant"].as_u64().unwrap() > 0, "{s}");
    // The native view: every frame as sampled, Python frames attached.
    let folded: Vec<(String, u64)> = std::fs::read_to_string(out.join("stacks-all-native.folded"))
        .unwrap()
        .lines()
        .map(|l| {
            let (a, b) = l.rsplit_once(' ').unwrap();
            (a.to_string(), b.parse().unwrap())
        })
        .collect();
    let total: u64 = folded.iter().map(|f| f.1).sum();
    let with = |pred: &dyn Fn(&str) -> bool| -> f64 {
        folded
            .iter()
            .filter(|f| pred(&f.0))
            .map(|f| f.1)
            .sum::<u64>() as f64
            / total as f64
    };
    let named = with(&|s| s.contains(";Py_BytesMain;") || s.contains(";clone"));
    let python = with(&|s| s.contains("(stacks_job.py)"));
    eprintln!("{total} samples: {named:.2} with named roots, {python:.2} with Python frames");
    assert!(named >= 0.8, "native frames are named: {named}");
    assert!(python >= 0.5, "Python frames are attached: {python}");
}

#[test]
fn a_sigint_sent_to_gpuprof_alone_is_said_as_such_and_spares_the_job() {
    use std::io::BufRead;
    let d = tmp();
    let job = "import signal, sys, time\n\
               def h(*a):\n    print('job got SIGINT', flush=True)\n    sys.exit(3)\n\
               signal.signal(signal.SIGINT, h)\n\
               print('ready', flush=True)\n\
               time.sleep(2)\n\
               print('job done', flush=True)\n";
    let mut g = gpuprof()
        .args(["--no-stacks", "-o"])
        .arg(d.path().join("out"))
        .args(["--", "python3", "-c", job])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(g.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // To gpuprof's PID alone, from this process (another process group).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(g.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    // gpuprof leads its own group (process_group(0)).
    let pgid = g.id();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let o = g.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(rest, ["job done"], "the job ran on untouched: {err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
    let me = std::process::id();
    assert!(
        err.contains(&format!(
            "SIGINT from pid {me} reached gpuprof and is not passed on"
        )) && err.contains(&format!("`kill -INT -{pgid}`")),
        "{err}"
    );
    assert!(!err.contains("Ctrl-C went to the job"), "{err}");
}

/// Report a copy of `base`'s recording whose events file is `bytes`.
/// `file` with 16 bytes from `at` flipped: damage inside one gzip member.
fn garbled(file: &[u8], at: usize) -> Vec<u8> {
    let mut bad = file.to_vec();
    for b in &mut bad[at..at + 16] {
        *b ^= 0xa5;
    }
    bad
}

/// A report of `base`'s recording (with its header copy) whose events file
/// is replaced by `bytes`.
fn report_damaged(
    root: &Path,
    base: &Path,
    name: &str,
    bytes: &[u8],
) -> (serde_json::Value, String) {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("recording")).unwrap();
    std::fs::write(dir.join("recording/events.jsonl.gz"), bytes).unwrap();
    std::fs::copy(
        base.join("recording/header.json"),
        dir.join("recording/header.json"),
    )
    .unwrap();
    let o = gpuprof()
        .arg("report")
        .arg("-q")
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{name}: {err}");
    (report(&dir), err)
}

#[test]
fn a_damaged_recording_loses_only_the_damaged_part_and_says_how_much() {
    let d = tmp();
    let busy = "import time\nt = time.time()\nwhile time.time() - t < 3: pass\n";
    let (base, o) = record(d.path(), "base", &[], &["python3", "-c", busy]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r0 = report(&base);
    assert_eq!(r0["warnings"], serde_json::json!([]), "{}", r0["warnings"]);
    let dur0 = r0["duration_s"].as_f64().unwrap();
    let samples0 = r0["stacks"]["samples"].as_u64().unwrap_or(0);
    let job_cpu0 = job_process(&r0)["cpu_s"].as_f64().unwrap();
    assert!(
        dur0 > 2.5 && job_cpu0 > 0.5,
        "{dur0} s, job {job_cpu0} s CPU"
    );
    let file = std::fs::read(base.join("recording/events.jsonl.gz")).unwrap();

    // 1. Line 3 garbled (the file re-compressed in one piece, as a user
    // editing it would): that line is skipped, the rest is read.
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&file[..]), &mut text)
        .unwrap();
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    assert!(lines.len() > 50, "{} lines", lines.len());
    lines[2] = b"{\"k\":\"process\",\"t\":12,\"pid\":\xff";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &lines.join(&b'\n')).unwrap();
    let (r, err) = report_damaged(d.path(), &base, "line", &gz.finish().unwrap());
    let w = r["warnings"].to_string();
    assert!(w.contains("1 damaged line(s)"), "{w} {err}");
    assert!(
        r["duration_s"].as_f64().unwrap() >= dur0 * 0.99,
        "{}",
        r["duration_s"]
    );
    assert!(r["stacks"]["samples"].as_u64().unwrap_or(0) >= samples0 * 99 / 100);
    assert!(job_process(&r)["cpu_s"].as_f64().unwrap() >= job_cpu0 * 0.99);

    // 2. Bytes garbled inside a block of the compressed file (the writer
    // ends a gzip member every second; the first holds the header and the
    // processes): the damaged block is skipped, reading goes on with the
    // next one, and the warning says how many bytes and which seconds were
    // lost.
    let members: Vec<usize> = (0..file.len() - 3)
        .filter(|&i| file[i..i + 4] == [0x1f, 0x8b, 0x08, 0x00])
        .collect();
    assert!(members.len() >= 3, "gzip members at {members:?}");
    let mid = (members[members.len() - 2] + members[members.len() - 1]) / 2;
    let (r, err) = report_damaged(d.path(), &base, "bytes", &garbled(&file, mid));
    let w = r["warnings"].to_string();
    assert!(
        w.contains("block(s) could not be decoded") && w.contains("events are missing at"),
        "{w} {err}"
    );
    assert!(
        r["duration_s"].as_f64().unwrap() >= dur0 * 0.99,
        "{}",
        r["duration_s"]
    );
    // The end of the recording (the job's exit, its last CPU figures) is
    // still read.
    assert_eq!(r["exit_code"], r0["exit_code"]);
    let cpu = job_process(&r)["cpu_s"].as_f64().unwrap();
    assert!(
        cpu >= job_cpu0 * 0.5 && cpu <= job_cpu0 * 1.01,
        "{cpu} of {job_cpu0} s"
    );

    // 2b. The block after the header, which holds the job's process
    // record: the job is kept, known from its samples, with its CPU total
    // (its counters run from its start) and said to be recovered.
    let first = (members[1] + members[2]) / 2;
    let (r, err) = report_damaged(d.path(), &base, "first", &garbled(&file, first));
    let w = r["warnings"].to_string();
    assert!(
        w.contains("block(s) could not be decoded") && w.contains("known only from their samples"),
        "{w} {err}"
    );
    let job = job_process(&r);
    assert_eq!(job["recovered"], true, "{job}");
    assert_eq!(job["role"], "main", "{job}");
    let cpu = job["cpu_s"].as_f64().unwrap();
    assert!(
        cpu >= job_cpu0 * 0.99 && cpu <= job_cpu0 * 1.01,
        "{cpu} of {job_cpu0} s"
    );
    assert_eq!(r0["processes"][0]["recovered"], false);

    // 2c. The header's own block: the header is read from its copy beside
    // the recording, and the rest of the recording as usual.
    let (r, err) = report_damaged(d.path(), &base, "header", &garbled(&file, members[1] / 2));
    let w = r["warnings"].to_string();
    assert!(w.contains("its copy"), "{w} {err}");
    assert_eq!(r["exit_code"], r0["exit_code"]);
    let cpu = job_process(&r)["cpu_s"].as_f64().unwrap();
    assert!(cpu >= job_cpu0 * 0.99, "{cpu} of {job_cpu0} s");
    assert!(r["stacks"]["samples"].as_u64().unwrap_or(0) >= samples0 * 99 / 100);

    // 3. A 40 MB line (over the 16 MB bound): skipped as it streams by, in
    // one pass, and counted; the rest is read.
    let mut long = b"{\"k\":\"coverage\",\"source\":\"".to_vec();
    long.resize(40 << 20, b'x');
    long.extend_from_slice(b"\"}");
    let mut with_long = lines.clone();
    with_long[2] = &long;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &with_long.join(&b'\n')).unwrap();
    let t = Instant::now();
    let (r, err) = report_damaged(d.path(), &base, "long", &gz.finish().unwrap());
    let took = t.elapsed();
    let w = r["warnings"].to_string();
    assert!(w.contains("1 line(s) longer than 16 MB"), "{w} {err}");
    assert!(
        r["duration_s"].as_f64().unwrap() >= dur0 * 0.99,
        "{}",
        r["duration_s"]
    );
    assert!(took < Duration::from_secs(10), "{took:?} for a 40 MB line");
}
