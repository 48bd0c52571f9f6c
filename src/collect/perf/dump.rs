//! `gpuprof dump PID`: every thread's Python and native stack of a running
//! job (PID and the processes below it), without recording and without
//! stopping it — the wall-clock sampler's read of a blocked thread
//! ([`super::offcpu`]), done once, symbolized at once.
//!
//! A blocked thread gets its native stack (copied and unwound with the
//! DWARF unwinder, the read checked before and after as the sampler does)
//! and its Python frames with line numbers (py-spy, non-blocking). A
//! running thread's native stack cannot be read without stopping it: its
//! Python frames only are shown, and it is said to be running.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use py_spy::config::{LineNo, LockingStrategy};
use py_spy::{Config, PythonSpy};

use super::offcpu::{copy_memory, parse_syscall, syscall_marker};
use super::sample::Sample;
use super::unwind::{self, Files, ProcessMaps, UnwindCache};
use crate::event::{MonoNs, Pid, Tid};

/// A thread as dumped.
struct ThreadDump {
    tid: Tid,
    comm: String,
    /// `[syscall: futex]`, or None when running (or unreadable).
    state: String,
    /// Innermost first: (name, file:line).
    python: Vec<(String, String)>,
    /// Innermost first: (file id, file offset).
    native: Vec<(u32, u64)>,
}

fn read_trim(path: String) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What a process of the job is: "rank R", "worker of rank R",
/// "DataLoader worker", or its command name.
fn label(pid: i32) -> String {
    let comm = read_trim(format!("/proc/{pid}/comm"));
    let rank = crate::collect::procfs::read_rank_env(pid).and_then(|e| e.get("RANK").cloned());
    match (comm == "pt_data_worker", rank) {
        (true, Some(r)) => format!("worker of rank {r}"),
        (true, None) => "DataLoader worker".into(),
        (false, Some(r)) => format!("rank {r}"),
        (false, None) => comm,
    }
}

fn python_traces(pid: i32) -> BTreeMap<i32, Vec<(String, String)>> {
    let config = Config {
        blocking: LockingStrategy::NonBlocking,
        native: false,
        lineno: LineNo::LastInstruction,
        ..Config::default()
    };
    let mut out = BTreeMap::new();
    let exe = crate::collect::python::exe_of(pid);
    if !crate::collect::python::looks_like_python(Pid(pid), &exe) {
        return out;
    }
    let Some(Ok(mut spy)) = crate::collect::quietly(|| PythonSpy::new(pid, &config)) else {
        return out;
    };
    let Some(Ok(traces)) = crate::collect::quietly(|| spy.get_stack_traces()) else {
        return out;
    };
    let single = traces.len() == 1;
    for tr in traces {
        let tid = match tr.os_thread_id {
            Some(id) => id as i32,
            None if single => pid,
            None => continue,
        };
        let frames = tr
            .frames
            .iter()
            .map(|f| (f.name.clone(), format!("{}:{}", f.filename, f.line)))
            .collect();
        out.insert(tid, frames);
    }
    out
}

/// One process's threads.
fn dump_process(
    pid: i32,
    files: &mut Files,
    cache: &mut UnwindCache,
    unknown: u32,
    stack_size: usize,
) -> Vec<ThreadDump> {
    let mut maps = ProcessMaps::default();
    for m in unwind::proc_maps(Pid(pid)) {
        maps.add(files, &m);
    }
    let python = python_traces(pid);
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    let mut out = Vec::new();
    for tid in tids {
        let path = |f: &str| format!("/proc/{pid}/task/{tid}/{f}");
        let before = read_trim(path("syscall"));
        let mut native = Vec::new();
        let state = match parse_syscall(&before) {
            None => "running".to_string(),
            Some(line) => {
                let runtime = read_trim(path("schedstat"));
                let stack = copy_memory(Pid(pid), line.sp, stack_size);
                let same =
                    read_trim(path("syscall")) == before && read_trim(path("schedstat")) == runtime;
                if let (Some(stack), true) = (stack, same) {
                    #[cfg(target_arch = "x86_64")]
                    let regs = [0, line.sp, line.pc, 0];
                    #[cfg(target_arch = "aarch64")]
                    let regs = [0, 0, line.sp, line.pc];
                    let s = Sample {
                        pid: Pid(pid),
                        tid: Tid(tid),
                        t: MonoNs::now(),
                        regs: Some(regs),
                        ip: line.pc,
                        stack,
                    };
                    if let Some(u) =
                        unwind::unwind(&maps, cache, &s, unknown, 0, &mut |p| files.id_of_text(p))
                    {
                        native = u.frames;
                    }
                    format!("blocked {}", syscall_marker(line.nr, false))
                } else {
                    "blocked (it woke while read: native frames not read)".into()
                }
            }
        };
        out.push(ThreadDump {
            tid: Tid(tid),
            comm: read_trim(path("comm")),
            state,
            python: python.get(&tid).cloned().unwrap_or_default(),
            native,
        });
    }
    out
}

/// The dump of PID and every process below it, as text.
pub fn dump(root: Pid, stack_size: u32) -> Result<String, String> {
    Ok(dump_with_summary(root, stack_size)?.0)
}

/// [`dump`], and one line per rank (or for the root process when there is
/// no rank) saying where its main thread is: its state, its innermost
/// Python function (file:line) or else its innermost named native one.
pub fn dump_with_summary(root: Pid, stack_size: u32) -> Result<(String, Vec<String>), String> {
    if !std::path::Path::new(&format!("/proc/{}", root.0)).exists() {
        return Err(format!("no process {} on this machine", root.0));
    }
    let mut pids = vec![root.0];
    pids.extend(crate::collect::python::descendants(root.0));
    let mut files = Files::default();
    let unknown = files.id_of("[unknown]");
    let mut cache = UnwindCache::default();
    let mut procs = Vec::new();
    for pid in pids {
        let threads = dump_process(pid, &mut files, &mut cache, unknown, stack_size as usize);
        procs.push((pid, label(pid), threads));
    }
    // Name every native frame, file by file.
    let paths: BTreeMap<u32, String> = files.new.drain(..).collect();
    let mut by_file: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
    let mut ids: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    for (_, _, threads) in &procs {
        for t in threads {
            for &(f, o) in &t.native {
                let n = ids.len() as u32;
                let id = *ids.entry((f, o)).or_insert(n);
                if let Some(p) = paths.get(&f) {
                    by_file.entry(p.clone()).or_default().push((id, o));
                }
            }
        }
    }
    let names: BTreeMap<u32, String> =
        super::symbolize::symbolize_with(&super::symbolize::symbolizer(), &by_file)
            .into_iter()
            .collect();
    let native_name = |f: u32, o: u64| -> (String, String) {
        let file = paths.get(&f).map_or("?", |p| p.as_str());
        let base = file.rsplit('/').next().unwrap_or(file).to_string();
        let name = ids
            .get(&(f, o))
            .and_then(|id| names.get(id))
            .cloned()
            .unwrap_or_else(|| format!("[{base}+{o:#x}]"));
        (name, base)
    };
    let mut out = String::new();
    let mut summary = Vec::new();
    let ranks = procs.iter().any(|p| p.1.starts_with("rank "));
    for (pid, label, threads) in &procs {
        let cmd = read_trim(format!("/proc/{pid}/cmdline")).replace('\0', " ");
        let _ = writeln!(out, "process {pid} ({label}): {}", cmd.trim());
        for t in threads {
            let _ = writeln!(out, "  thread {} ({}): {}", t.tid.0, t.comm, t.state);
            for (name, at) in &t.python {
                let _ = writeln!(out, "    py  {name} ({at})");
            }
            for (f, o) in &t.native {
                let (name, base) = native_name(*f, *o);
                let _ = writeln!(out, "    c   {name} ({base})");
            }
        }
        let main = threads.iter().find(|t| t.tid.0 == *pid);
        if let Some(t) = main.filter(|_| label.starts_with("rank ") || (!ranks && *pid == root.0)) {
            let at = match t.python.first() {
                Some((name, at)) => format!("in {name} ({at})"),
                None => t
                    .native
                    .iter()
                    .map(|&(f, o)| native_name(f, o))
                    .find(|(n, _)| !n.starts_with('['))
                    .map_or("(no frames read)".to_string(), |(n, b)| {
                        format!("in {n} ({b})")
                    }),
            };
            summary.push(format!("{label} (pid {pid}): {} {at}", t.state));
        }
    }
    Ok((out, summary))
}
