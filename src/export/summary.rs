//! The short diagnosis in plain words: `summary.md` (Markdown, to paste
//! into a pull request) and the same lines on the terminal.

use crate::analysis::{Analysis, Role};
use crate::diagnose::{Diagnosis, Severity};
use crate::event::JobStatus;

fn mb(b: u64) -> String {
    crate::units::bytes(b as f64)
}

/// "8 processes: 2 main, 2 workers, 1 launcher, 3 other." and, with ranks,
/// "8 processes: 1 launcher, 2 ranks (0, 1), 2 workers (1 of rank 0, 1 of
/// rank 1), 3 other."
fn process_counts(a: &Analysis) -> String {
    let ranks = a.ranks();
    let count = |r: Role| a.processes_with_role(r).count();
    if ranks.is_empty() {
        let parts: Vec<String> = Role::ALL
            .into_iter()
            .filter(|r| *r != Role::Launcher || count(*r) > 0)
            .map(|r| r.plural(count(r)))
            .collect();
        return format!("{} processes: {}.", a.processes.len(), parts.join(", "));
    }
    let mut parts = Vec::new();
    if count(Role::Launcher) > 0 {
        parts.push(Role::Launcher.plural(count(Role::Launcher)));
    }
    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    parts.push(format!(
        "{} rank{} ({})",
        ranks.len(),
        if ranks.len() == 1 { "" } else { "s" },
        if list.len() > 16 {
            format!("{} … {}", list[0], list[list.len() - 1])
        } else {
            list.join(", ")
        }
    ));
    for role in [Role::Worker, Role::Main, Role::Other] {
        // Main processes of ranks are the ranks themselves.
        let ps: Vec<_> = a
            .processes_with_role(role)
            .filter(|p| role != Role::Main || p.rank.is_none())
            .collect();
        let n = ps.len();
        if n == 0 {
            continue;
        }
        let per_rank: Vec<String> = ranks
            .iter()
            .filter_map(|r| {
                let k = ps.iter().filter(|p| p.rank == Some(*r)).count();
                (k > 0).then(|| format!("{k} of rank {r}"))
            })
            .collect();
        if per_rank.is_empty() || per_rank.len() > 8 {
            parts.push(role.plural(n));
        } else {
            parts.push(format!("{} ({})", role.plural(n), per_rank.join(", ")));
        }
    }
    format!("{} processes: {}.", a.processes.len(), parts.join(", "))
}

/// The "Run" section: what was recorded, how the job ended, processes
/// and their CPU time by role.
fn run_lines(a: &Analysis) -> Vec<String> {
    let status = match a.job_status() {
        Some(JobStatus::Exited(c)) => format!("exit code {c}"),
        Some(JobStatus::Signaled(s)) => format!("killed by signal {s} (exit code {})", 128 + s),
        Some(JobStatus::StillRunning) => "still running when recording stopped".into(),
        Some(JobStatus::EndedUnknown) => {
            "ended while attached (its exit status goes to its parent, not to gpuprof)".into()
        }
        None => "end not recorded".into(),
    };
    let attached = a.header.attached.as_ref().map(|at| {
        format!(
            "Attached to PID {} after it had run {:.0} s: figures cover the recorded window only.",
            a.header.job_pid,
            a.header.start.secs_since(at.process_start)
        )
    });
    let mut run: Vec<String> = attached.into_iter().collect();
    run.extend([
        format!(
            "Recorded {:.1} s of `{}`; {status}.",
            a.duration_s(),
            a.header.command.join(" ")
        ),
        process_counts(a),
    ]);
    for role in Role::ALL {
        let ps: Vec<_> = a.processes_with_role(role).collect();
        if ps.is_empty() {
            continue;
        }
        let cpu: f64 = ps.iter().map(|p| p.cpu_s()).sum();
        run.push(format!("CPU time of {role} processes: {cpu:.1} s."));
    }
    run
}

/// Every thread that used CPU, with its line (busiest first once sorted).
fn thread_lines(a: &Analysis) -> Vec<(f64, String)> {
    let mut threads: Vec<(f64, String)> = Vec::new();
    let dur = a.duration_s().max(1e-9);
    for p in a.processes.values() {
        for t in p.threads.values() {
            let cpu = (t.user_ns + t.sys_ns) as f64 / 1e9;
            if cpu > 0.0 {
                let life = {
                    let (f, e) = p.lifetime(a.end);
                    (e.secs_since(f)).clamp(1e-3, dur)
                };
                threads.push((
                    cpu,
                    format!(
                        "`{}` (thread {} of {} process {}): {:.1} s CPU, {:.0}% of a core while alive",
                        t.comm,
                        t.tid,
                        p.label(),
                        p.pid,
                        cpu,
                        cpu / life * 100.0
                    ),
                ));
            }
        }
    }
    threads
}

/// The "System" section: machine CPU, the job's IO, disks, pressure,
/// swapping.
fn system_lines(a: &Analysis) -> Vec<String> {
    let s = &a.system;
    let mut sys = Vec::new();
    if !s.busy.is_empty() {
        sys.push(format!(
            "Machine CPU {:.0}% busy on average ({} CPUs), iowait {:.1}%, steal {:.1}%.",
            s.busy.mean(),
            s.cpus,
            s.iowait.mean(),
            s.steal.mean()
        ));
    }
    let (rb, wb): (u64, u64) = a.processes.values().fold((0, 0), |acc, p| {
        (acc.0 + p.read_bytes, acc.1 + p.write_bytes)
    });
    sys.push(format!(
        "The job read {} and wrote {} from/to storage.",
        mb(rb),
        mb(wb)
    ));
    for d in s
        .disks
        .values()
        .filter(|d| d.read_bytes + d.write_bytes > 0)
    {
        sys.push(format!(
            "Disk {}: busy {:.0}% on average (max {:.0}%), read {}, wrote {}.",
            d.name,
            d.busy.mean().max(0.0),
            d.busy.max().max(0.0),
            mb(d.read_bytes),
            mb(d.write_bytes)
        ));
    }
    if !s.psi_cpu.some.is_empty() {
        sys.push(format!(
            "Pressure (share of time stalled): CPU {:.1}%, IO {:.1}%, memory {:.1}%.",
            s.psi_cpu.some.mean(),
            s.psi_io.some.mean(),
            s.psi_memory.some.mean()
        ));
    }
    if s.swap_in_bytes + s.swap_out_bytes > 0 {
        sys.push(format!(
            "Swapping: {} in, {} out.",
            mb(s.swap_in_bytes),
            mb(s.swap_out_bytes)
        ));
    }
    sys
}

/// Sections of the summary, each a title and lines; rendered as Markdown
/// or for the terminal.
pub fn sections(a: &Analysis) -> Vec<(String, Vec<String>)> {
    let mut out = vec![("Run".to_string(), run_lines(a))];

    let gpu = super::report_gpu::summary_lines(a);
    if !gpu.is_empty() {
        out.push(("GPU".to_string(), gpu));
    }

    let steps = super::report_nvtx::steps_lines(a);
    if !steps.is_empty() {
        out.push(("Steps".to_string(), steps));
    }
    let nvtx = super::report_nvtx::summary_lines(a);
    if !nvtx.is_empty() {
        out.push(("NVTX ranges".to_string(), nvtx));
    }
    let waits = wait_lines(a);
    if !waits.is_empty() {
        out.push(("Where the loop waits".to_string(), waits));
    }

    let mut threads = thread_lines(a);
    threads.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    if !threads.is_empty() {
        out.push((
            "Busiest threads".to_string(),
            threads.into_iter().take(5).map(|t| t.1).collect(),
        ));
    }

    out.push(("System".to_string(), system_lines(a)));

    let missing: Vec<String> = a
        .coverage
        .values()
        .filter(|c| !c.available)
        .map(|c| format!("{}: {}", c.source, c.detail))
        .collect();
    if !missing.is_empty() {
        out.push(("Not measured".to_string(), missing));
    }
    if !a.warnings.is_empty() {
        out.push(("Warnings".to_string(), a.warnings.clone()));
    }
    out
}

/// The ranked findings as Markdown: what, GPU time, evidence, fix, and the
/// `gpuprof explain` command for more. No links: summary.md is pasted into
/// other repositories' pull requests, where a relative link would be dead.
pub fn findings_markdown(d: &Diagnosis) -> String {
    let mut s = String::from("\n## Diagnosis\n\n");
    for n in &d.notes {
        s.push_str(&format!("_{n}_\n\n"));
    }
    if d.findings.is_empty() {
        s.push_str("No finding: nothing in this run points at a cause of GPU waiting.\n");
        return s;
    }
    for (i, f) in d.findings.iter().enumerate() {
        s.push_str(&finding_markdown(i + 1, "", f));
    }
    s
}

/// One finding as a numbered Markdown item; `prefix` goes before its title
/// (the node's name in a merge).
pub fn finding_markdown(n: usize, prefix: &str, f: &crate::diagnose::Finding) -> String {
    let mut s = format!(
        "{n}. **{} · `{}`** — {prefix}{}.  \n   {}.\n",
        f.severity,
        f.kind.id(),
        f.title,
        capitalize(&f.gpu_time_text())
    );
    if let Some(g) = &f.gpu_time {
        s.push_str(&format!("   _How: {}._\n", g.method));
    }
    for e in &f.evidence {
        s.push_str(&format!("   - {e}\n"));
    }
    s.push_str(&format!("\n   **Fix:** {}\n", f.fix));
    s.push_str(&format!("   More: `{}`\n\n", f.kind.docs()));
    s
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The ranked findings for the terminal: a few lines each; `info`
/// findings in one line.
pub fn findings_terminal(d: &Diagnosis) -> String {
    let mut s = String::from("\n== gpuprof diagnosis ==\n");
    for n in &d.notes {
        s.push_str(&format!("({n})\n"));
    }
    if d.findings.is_empty() {
        s.push_str("No finding: nothing in this run points at a cause of GPU waiting.\n");
        return s;
    }
    for (i, f) in d.findings.iter().enumerate() {
        s.push_str(&format!(
            "{}. [{}] {}: {}\n",
            i + 1,
            f.severity,
            f.kind.id(),
            f.title
        ));
        if f.severity == Severity::Info {
            // A possible finding says how long to record to know.
            if let Some(line) = f
                .support
                .as_ref()
                .filter(|x| !x.established)
                .and_then(|_| f.evidence.last())
            {
                s.push_str(&format!("   {}\n", line.replace('`', "")));
            }
            s.push_str(&format!("   see {}\n", f.kind.docs()));
            continue;
        }
        s.push_str(&format!("   {}\n", capitalize(&f.gpu_time_text())));
        for e in &f.evidence {
            s.push_str(&format!("   - {}\n", e.replace('`', "")));
        }
        s.push_str(&format!("   Fix: {}\n", f.fix.replace('`', "")));
        s.push_str(&format!("   See {}\n", f.kind.docs()));
    }
    s
}

pub fn markdown(a: &Analysis, d: &Diagnosis) -> String {
    let mut s = String::from("# gpuprof summary\n");
    s.push_str(&findings_markdown(d));
    let ranks = crate::diagnose::ranks::summary_lines(&d.ranks);
    if !ranks.is_empty() {
        s.push_str("\n## Ranks\n\n");
        for l in ranks {
            s.push_str(&format!("- {l}\n"));
        }
    }
    let env = d.environment.lines();
    if !env.is_empty() {
        s.push_str("\n## Software and data\n\n");
        for l in env {
            s.push_str(&format!("- {l}\n"));
        }
    }
    for (title, lines) in sections(a) {
        s.push_str(&format!("\n## {title}\n\n"));
        for l in lines {
            s.push_str(&format!("- {l}\n"));
        }
    }
    s
}

pub fn terminal(a: &Analysis, d: &Diagnosis) -> String {
    let mut s = findings_terminal(d);
    s.push_str("\n== gpuprof summary ==\n");
    let ranks = crate::diagnose::ranks::summary_lines(&d.ranks);
    if !ranks.is_empty() {
        s.push_str("Ranks:\n");
        for l in ranks {
            s.push_str(&format!("  {}\n", l.replace('`', "")));
        }
    }
    for (title, lines) in sections(a) {
        s.push_str(&format!("{title}:\n"));
        for l in lines {
            s.push_str(&format!("  {}\n", l.replace('`', "")));
        }
    }
    s
}

/// One line per process main thread the wall-clock sampler looked at
/// (workers' loops and launchers are left out): its wall time on a CPU and
/// blocked by wait class, most first. Without looks there is no line: the
/// waits were not measured (the "Not measured" section says why perf was
/// unavailable), which is not 0%.
fn wait_lines(a: &Analysis) -> Vec<String> {
    let mut out = Vec::new();
    for t in &a.waits.threads {
        let Some(p) = a.processes.get(&t.pid) else {
            continue;
        };
        if t.pid.0 != t.tid.0 || p.role != Role::Main {
            continue;
        }
        let mut parts: Vec<(f64, String)> = t
            .waits
            .iter()
            .filter(|(_, c)| c.samples > 0)
            .map(|(k, c)| (c.share, format!("{} {}", k.label(), share_text(c.share))))
            .collect();
        parts.sort_by(|x, y| y.0.total_cmp(&x.0));
        let mut text = vec![format!("on a CPU {}", share_text(t.on_cpu.share))];
        text.extend(parts.into_iter().map(|p| p.1));
        if t.unknown.samples > 0 {
            text.push(format!("unknown {}", share_text(t.unknown.share)));
        }
        // What the largest wait means for the loop, when it is a class
        // that says it.
        let verdict = t
            .waits
            .iter()
            .max_by(|x, y| x.1.share.total_cmp(&y.1.share))
            .filter(|(_, c)| c.share >= 0.2)
            .and_then(|(k, _)| match k {
                crate::analysis::waits::WaitClass::GpuSync => {
                    Some(" GPU-bound: the loop mostly waits for the GPU.")
                }
                crate::analysis::waits::WaitClass::NextBatch => {
                    Some(" Input-bound: the loop mostly waits for its next batch.")
                }
                crate::analysis::waits::WaitClass::Collective => {
                    Some(" It mostly waits for the other ranks (see the ranks).")
                }
                crate::analysis::waits::WaitClass::Gil => {
                    Some(" It mostly waits for the GIL (see gil-contention).")
                }
                _ => None,
            })
            .unwrap_or("");
        let counted = if t.steady {
            "loop's steady state"
        } else {
            "its life"
        };
        let who = match p.rank {
            Some(r) => format!("Rank {r}'s main thread"),
            None => "The main thread".to_string(),
        };
        out.push(format!(
            "{who} ({:.1} s, {counted}): {}.{verdict}",
            t.span_s,
            text.join(", ")
        ));
    }
    out
}

/// A share of time: a figure that was seen is never "0%".
fn share_text(x: f64) -> String {
    if x > 0.0 && x < 0.005 {
        "<1%".into()
    } else {
        format!("{:.0}%", x * 100.0)
    }
}
